"""`python -m edgeinspect.services.stage --config FILE`."""

from edgeinspect.services.common.entry import role_main
from edgeinspect.services.stage.server import main

role_main(main, "decoder stage")
