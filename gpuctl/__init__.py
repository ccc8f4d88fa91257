"""gpuctl: the user's side of gpud, as a CLI (the console script ``gpuctl.fastpath.main``,
which leaves all but plain sbatch and squeue command lines to the click group in
``gpuctl.main``) and a Python API.

    from gpuctl import Client
    with Client() as c:
        job_id = c.submit(wrap="python train.py", gpus=2, time_limit="4:00:00")
        print(c.wait(job_id)["state"])
"""

from gpud.protocol import ProtocolError, RemoteError

from .client import Client, HeadUnavailable

__all__ = ["Client", "HeadUnavailable", "RemoteError", "ProtocolError"]
