"""Byte sources on object stores, imported only for store URLs. Read side: `source` (a prefix as a confined
source), `store` (one bucket: checked listings, accounting, in-flight slots), `ranged` (ranged reads into the
caller's buffers, a block cache for small ones), `errors`; one client per protocol behind `backend`'s small
protocol (`s3`: boto3; `cloud`: obstore for gs:// and az://; `fs`: fsspec for any other protocol)."""
