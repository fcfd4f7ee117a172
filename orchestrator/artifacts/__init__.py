"""Artifacts: files a command publishes from its device's workspace, kept per task,
content-addressed by sha256, and fetched by nodes on other devices or downloaded by people.

How the bytes move (docs/how-to/artifacts.md):

- A device uploads for one of its open batches (`uploads`): it declares name, size and sha256,
  then sends the bytes in pieces of at most one request body, each at the offset the server has
  staged (`Upload-Offset`), so a dropped connection or a restarted orchestrator resumes where it
  stopped. When the last byte is in, the server checks the sha256 of what it staged against the
  declared one, promotes the bytes to the blob of that sha256 and records the artifact (task,
  node, device, name, version, sha256, size), committed before it answers; only then does the
  agent's tool report success.
- Blobs (`blobs`) live under the data dir with SQLite (written to a staging file, fsynced,
  renamed to `blobs/<sha[:2]>/<sha>`), or in the database on Postgres (`dbblobs`: chunk rows any
  replica can stream). No blob is ever held whole in memory: at most one piece on each side.
- Reads are streams with `Content-Length`, `ETag` (the sha256) and single `Range` requests
  (`ranges`); a browser gets a short-lived link signed for one artifact (`links`).
"""
