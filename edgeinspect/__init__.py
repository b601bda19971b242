"""edgeinspect: on-prem visual inspection with DeepSeek-VL split across edge boxes."""

__version__ = "0.1.0"
# Bumped whenever a wire contract changes incompatibly; peers refuse a different major.
PROTOCOL_VERSION = "edgeinspect.v1"
