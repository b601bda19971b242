"""The line: the PLC handshake over OPC UA (ingest hosts it, where the camera is), the takt budget, plc-sim."""
