"""`python -m edgeinspect.services.retrieval --config FILE`."""

from edgeinspect.services.common.entry import role_main
from edgeinspect.services.retrieval.server import main

role_main(main, "retrieval")
