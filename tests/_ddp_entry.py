"""torchrun entry point for tests/test_distributed.py: `highway_repro.train.main`, optionally crashing.

    torchrun --standalone --nproc_per_node 2 tests/_ddp_entry.py <hydra overrides>

With HIGHWAY_TEST_CRASH_AT=N every rank raises in the forward pass of training step N
(a crash mid-run, after the checkpoint of an earlier step was written).
"""

import os

from highway_repro.engine.trainer import Trainer

CRASH_AT = int(os.environ.get("HIGHWAY_TEST_CRASH_AT", "-1"))

if CRASH_AT >= 0:
    _forward = Trainer._forward

    def _dying(self, batch, mems, score_len):
        if self.model.training and self.step == CRASH_AT:
            raise RuntimeError(f"simulated crash at step {CRASH_AT}")
        return _forward(self, batch, mems, score_len)

    Trainer._forward = _dying

if __name__ == "__main__":
    from highway_repro.train import main

    main()
