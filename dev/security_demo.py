"""The kernel cache's trust model, end to end with the real nvcc (README "Security"; issue 28):

    python dev/security_demo.py [CONFIG]

1. a private cache: build, load, `cache ls --verify`, the modes the store gave everything, `cache clear`;
2. a world-writable cache holding a planted entry (the same kernel name, key and a meta.json that vouches for the
   .so, written by another user: chowned to uid 4242 when run as root): the load is refused before dlopen.
"""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = sys.argv[1] if len(sys.argv) > 1 else "bsk_sm90a_attn_fwd_d64_fp16_t128x128_coop_s8_b128x128"


def cli(*args, cache):
    env = dict(os.environ, BSK_CACHE_DIR=str(cache))
    r = subprocess.run([sys.executable, "-m", "blackwell_sparsek", *args], env=env, capture_output=True, text=True)
    print(f"$ BSK_CACHE_DIR={cache} python -m blackwell_sparsek {' '.join(args)}   (exit {r.returncode})")
    print("  " + (r.stdout + r.stderr).strip().replace("\n", "\n  "))
    return r


def main() -> int:
    top = Path(tempfile.mkdtemp(prefix="bsk-sec-"))
    old = os.umask(0)  # the worst umask: the store must still make everything private
    try:
        private = top / "private"
        cli("build", CONFIG, cache=private)
        cli("cache", "ls", "--verify", cache=private)
        for p in sorted([private, *private.rglob("*")]):
            print(f"  {stat.filemode(p.lstat().st_mode)}  {p.relative_to(top)}")

        shared = top / "shared"
        shutil.copytree(private, shared)  # the planted entry: right name, key and meta, another owner
        if os.geteuid() == 0:
            for p in [shared, *shared.rglob("*")]:
                os.chown(p, 4242, 4242)
        os.chmod(shared, 0o777)
        code = ("import blackwell_sparsek as b\n"
                "try:\n    b.build(%r)\nexcept b.BskError as e:\n    print(type(e).__name__ + ': ' + str(e))\n"
                "else:\n    print('LOADED (unsafe)')\n" % CONFIG)
        r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, BSK_CACHE_DIR=str(shared)),
                           capture_output=True, text=True)
        print(f"$ BSK_CACHE_DIR={shared} python -c 'blackwell_sparsek.build({CONFIG!r})'")
        print("  " + (r.stdout + r.stderr).strip())
        cli("cache", "clear", cache=private)
        refused = "UnsafeCacheError" in r.stdout
    finally:
        os.umask(old)
        shutil.rmtree(top, ignore_errors=True)
    print("planted entry refused" if refused else "PLANTED ENTRY LOADED")
    return 0 if refused else 1


if __name__ == "__main__":
    raise SystemExit(main())
