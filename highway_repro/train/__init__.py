"""Hydra entry point: compose, validate, build data -> model -> trainer, fit, write metrics.json.

    python -m highway_repro.train experiment=hn_fig1 scale=cpu
    python -m highway_repro.train -m sweep=hn_fig1/cpu scale=cpu hydra/launcher=grouped  # in groups

`app.py` is the Hydra app and the only module that knows all parts. Beside it: `config.py` checks the config
before torch is imported, `recipe.py` guards a run folder, `job.py` holds a job's run folder and makes user errors
one line, `grouped.py` trains a multirun's jobs in groups. This package itself imports nothing: `cli` catches the
stop signals before Hydra, torch or the app is imported (`runtime.stopped`)."""


def cli():
    """`python -m highway_repro.train`: a stop signal from the first moment is one line (`runtime.stopped`), then the
    app's command line (`app.command`). Launchers such as joblib and submitit pickle this function by reference."""
    from highway_repro.runtime import stopped

    with stopped():
        from highway_repro.train.app import command

        command()


APP_NAMES = ("CONFIG_DIR", "build_optimizer", "build_run", "main", "match_params", "run", "run_job")


def __getattr__(name: str):
    """`highway_repro.train.run` and the app's other names, imported from `app` when first asked for (PEP 562)."""
    if name not in APP_NAMES:
        raise AttributeError(f"module 'highway_repro.train' has no attribute {name!r}")
    from highway_repro.train import app

    return getattr(app, name)
