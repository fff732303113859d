"""Another process writing a directory, as a second run would meet it: its output marker and an
exclusive flock on <dir>/.lock holding its pid (peer_rl.files.out_paths.lock_dir)."""
from __future__ import annotations

import subprocess
import sys

HOLDER = """
import fcntl, json, os, pathlib, time
out = pathlib.Path({out!r})
out.mkdir(parents=True, exist_ok=True)
(out / ".peer-rl-out.json").write_text(json.dumps({{"command": {command!r}}}))
fh = open(out / ".lock", "a+")
fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
fh.truncate(0); fh.write(str(os.getpid())); fh.flush()
print("held", flush=True)
time.sleep(60)
"""


def hold_dir(out, command: str) -> subprocess.Popen:
    """Start the holder; it prints "held" once the lock is taken (read it before going on)."""
    return subprocess.Popen([sys.executable, "-c", HOLDER.format(out=str(out), command=command)],
                            stdout=subprocess.PIPE, text=True)
