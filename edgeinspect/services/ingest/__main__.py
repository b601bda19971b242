"""`python -m edgeinspect.services.ingest --config FILE`."""

from edgeinspect.services.common.entry import role_main
from edgeinspect.services.ingest.server import main

role_main(main, "ingest")
