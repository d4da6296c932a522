"""The input boundary's typed side: every structure read from a file becomes a frozen, typed record here."""
