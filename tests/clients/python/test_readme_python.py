"""The README's Python block ("From Python"), run as written against two real rl-workers behind
an rl-router: its address and the `build/step-100` checkpoint (a copy of stories260K) are the
only substitutions. It generates, builds a DataProto, sleeps the fleet, pushes the weights from
memory, wakes it, pushes again over a tcp group, updates from disk and catches a failed update."""

import os
import re
import shutil
import subprocess
import sys

import rltest


def readme_block():
    text = (rltest.ROOT / "README.md").read_text()
    start = text.index("From Python: the `rlfleet` package")
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m, "no python block after 'From Python'"
    return m.group(1)


def test_readme_python_block_runs_as_written(fleet2, tmp_path):
    import rlfleet
    step = tmp_path / "step-100"
    shutil.copytree(rltest.STORIES, step)
    code = readme_block()
    assert "update_weights_from_tensor" in code and "release_memory" in code
    assert "resume_memory" in code and "open_weights_group" in code
    code = code.replace("127.0.0.1:50051", fleet2.address).replace("build/step-100", str(step))
    site = os.path.dirname(os.path.dirname(rlfleet.__file__))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": site}, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "StatusCode.INVALID_ARGUMENT" in p.stdout and "/nope" in p.stdout
    with rlfleet.Client(fleet2.address) as c:
        assert {w.weight_version for w in c.list_workers().workers} == {3}
        assert not any(w.info.asleep or w.info.paused for w in c.get_server_info().workers)
