"""`python -m edgeinspect.services.vision --config FILE`."""

from edgeinspect.services.common.entry import role_main
from edgeinspect.services.vision.server import main

role_main(main, "vision")
