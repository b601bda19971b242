"""`python -m edgeinspect.services.console --config FILE`."""

from edgeinspect.services.common.entry import role_main
from edgeinspect.services.console.server import main

role_main(main, "console")
