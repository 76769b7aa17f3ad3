"""The process settings of the quality scripts (prune_quality*.py, attention_quality.py), imported before torch and
nmkit: transformers strictly offline (the models come from PyPI packages), and one thread unless the caller chose
otherwise. Their single-sentence batches gain nothing from more threads, and on a busy machine OpenMP's waiting
threads made torch's small ops and the C++ OBS solver ten to forty times slower. Set before torch and nmkit load
their OpenMP / OpenBLAS runtimes, which read them once."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
