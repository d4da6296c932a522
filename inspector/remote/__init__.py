"""Byte sources on object stores (`s3://`). Imported only for such URLs: boto3 is the optional `s3` extra."""
