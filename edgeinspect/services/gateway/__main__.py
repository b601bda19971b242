"""`python -m edgeinspect.services.gateway --config FILE`."""

from edgeinspect.services.common.entry import role_main
from edgeinspect.services.gateway.server import main

role_main(main, "gateway")
