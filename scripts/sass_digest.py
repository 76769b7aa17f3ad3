#!/usr/bin/env python3
"""One line per kernel of the given CUDA objects: registers, stack, instruction count and a hash of the SASS.

A change that only moves code between functions (kernel roles, options plumbing) should leave every line equal;
two digests are compared with `diff`. Needs cuobjdump and nvdisasm on PATH (the CUDA toolkit, or the PyPI wheels
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm).

  python3 scripts/sass_digest.py build/default/CMakeFiles/nmkit.dir/src/cuda/nm24/*.cu.o > before.txt
"""
import hashlib
import re
import subprocess
import sys

ARCH = re.compile(r"^\s*(?:arch = |code for )(sm_\w+)")
FUNCTION = re.compile(r"^\s*Function : (\S+)")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\*")
# Anonymous namespaces are named after the file's hash: equal kernels from edited files must still match.
ANONYMOUS = re.compile(r"\d*_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+")


def cuobjdump(*args):
    return subprocess.run(["cuobjdump", *args], check=True, capture_output=True, text=True).stdout


def per_arch(text):
    """(arch, line) for each line of cuobjdump's output, arch being the cubin the line belongs to."""
    arch = "?"
    for line in text.splitlines():
        if m := ARCH.match(line):
            arch = m.group(1)
        yield arch, line


def resources(text):
    found, arch, pending = {}, "?", None
    for arch, line in per_arch(text):
        if m := re.match(r"\s*Function (\S+):", line):
            pending = m.group(1)
        elif pending and (m := re.match(r"\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)):
            found[(arch, ANONYMOUS.sub("anon", pending))] = m.groups()
            pending = None
    return found


def kernels(sass):
    name, body = None, []
    for arch, line in per_arch(sass):
        if m := FUNCTION.match(line):
            if name:
                yield name, body
            name, body = (arch, ANONYMOUS.sub("anon", m.group(1))), []
        elif name and (m := INSTRUCTION.match(line)):
            # Branch targets are addresses: keep the opcode shape, drop the number.
            body.append(re.sub(r"0x[0-9a-f]+", "0x?", m.group(1)))
    if name:
        yield name, body


def main(paths):
    for path in paths:
        usage = resources(cuobjdump("-res-usage", path))
        for (arch, name), body in sorted(kernels(cuobjdump("-sass", path))):
            reg, stack, shared, local = usage.get((arch, name), ("?",) * 4)
            digest = hashlib.sha1("\n".join(body).encode()).hexdigest()[:12]
            print(f"{arch} {name} reg={reg} stack={stack} local={local} instructions={len(body)} sass={digest}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
