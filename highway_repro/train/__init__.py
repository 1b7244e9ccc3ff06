"""`python -m highway_repro.train experiment=hn_fig1 scale=cpu` (`-m sweep=... hydra/launcher=grouped`: in groups).

`app.py` is the Hydra app; `config.py` checks a config before torch is imported, `recipe.py` guards a run folder,
`job.py` holds a job's run folder and its failure policy, `grouped.py` trains jobs in groups. This package imports
nothing itself: `cli` catches stop signals before anything is imported (`runtime.stopped`)."""


def cli():
    """`python -m highway_repro.train` (launchers such as joblib and submitit pickle it by reference)."""
    from highway_repro.runtime import stopped

    with stopped():
        from highway_repro.train.app import command

        command()


APP_NAMES = ("CONFIG_DIR", "build_optimizer", "build_run", "main", "match_params", "run", "run_job")


def __getattr__(name: str):
    """The app's names, imported from `app` when first asked for (PEP 562)."""
    if name not in APP_NAMES:
        raise AttributeError(f"module 'highway_repro.train' has no attribute {name!r}")
    from highway_repro.train import app

    return getattr(app, name)
