"""On-disk formats: torch zip reader and restricted unpickler, streamed torch-zip writer, dtypes."""
