"""Hydra launcher `hydra/launcher=grouped` (configs/hydra/launcher/grouped.yaml): a multirun's jobs trained in
groups of one shape in this process (`highway_repro.train.grouped`). Hydra finds launchers only in the `hydra_plugins`
namespace package, hence this module; it sets up each job as Hydra's basic launcher does, with Hydra's public
`hydra.core.utils` functions."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import open_dict

log = logging.getLogger(__name__)


class GroupedLauncher(Launcher):
    def __init__(self, size="auto") -> None:
        super().__init__()
        self.size, self.config, self.task_function, self.hydra_context = size, None, None, None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from highway_repro.train import grouped

        grouped.group_size(self.size)  # a bad size: one line before any job is set up
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Setting up {len(job_overrides)} jobs, to train in groups (size {self.size})")
        runs = []
        with grouped.collecting() as jobs:
            for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
                log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
                sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                with open_dict(sweep_config):
                    sweep_config.hydra.job.id = idx
                    sweep_config.hydra.job.num = idx
                runs.append(run_job(hydra_context=self.hydra_context, task_function=self.task_function,
                                    config=sweep_config, job_dir_key="hydra.sweep.dir",
                                    job_subdir_key="hydra.sweep.subdir"))
                configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        grouped.train_groups(jobs, self.size)
        return runs
