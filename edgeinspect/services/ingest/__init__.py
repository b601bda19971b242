"""Camera ingestion: readers per camera, sampling and change gating, flow control, delivery to the gateway."""
