"""The companion file of tests/data/record_style_script.py (copied as helper.py beside it)."""


def mean_token(path):
    """The mean token id of a shard (1024-byte header, then little-endian uint16 tokens)."""
    with open(path, "rb") as f:
        body = f.read()[1024:]
    ids = [int.from_bytes(body[i:i + 2], "little") for i in range(0, len(body), 2)]
    return sum(ids) / len(ids)
