"""The command line: a face on the core (rich output, exit codes); the core never imports it."""
