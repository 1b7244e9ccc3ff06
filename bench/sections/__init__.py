"""The sections of `make bench`, one file each; `python -m bench --sections a,b` runs them in the order given.

Each section is a function `(rep: Report, budget: Budget, args) -> dict` that adds its rows, targets and one
markdown section to the report (bench/report.py)."""

from bench.sections.data import section_data
from bench.sections.gates import section_gates
from bench.sections.grouped import section_grouped
from bench.sections.highway import section_highway
from bench.sections.memory import section_memory
from bench.sections.precision import section_precision
from bench.sections.txl import section_txl
from bench.sections.xt import section_xt, section_xt_cpu

SECTIONS = {"xt": section_xt, "xt_cpu": section_xt_cpu, "txl": section_txl, "gates": section_gates,
            "highway": section_highway, "data": section_data, "memory": section_memory,
            "precision": section_precision, "grouped": section_grouped}
