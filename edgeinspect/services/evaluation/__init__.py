"""Go-live evaluation: labelled parts through the running cluster -> escape, overkill and per-class rates with
confidence intervals, a stored baseline and a regression gate (`edgeinspect eval`)."""
