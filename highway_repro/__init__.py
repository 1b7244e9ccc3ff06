"""highway-repro: reproductions of Highway Networks (Srivastava et al. 2015) and
Highway Transformer (Chai et al., ACL 2020)."""

__version__ = "0.1.0"
