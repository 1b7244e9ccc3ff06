"""Highway Transformer tables (placeholder; filled below)."""
from highway_repro.reproduce import Target

_SMOKE = ["seed=0"]
TARGETS = {
    "ht_char_ptb": Target("highway_transformer/char_ptb_l3", "ht_char_ptb", "ht_char_ptb",
                          {"paper": ["seed=1111"], "smoke": _SMOKE}),
}
