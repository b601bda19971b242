"""What an inspection leaves behind: the durable report store, its frames, and the report text and schema."""
