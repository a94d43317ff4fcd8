"""A GCS JSON API on 127.0.0.1 for the bucket tests: gcp-storage-emulator, run as a script.

  python tests/gcs_emulator.py BUCKET     creates BUCKET, prints the port it listens on, serves until killed

The emulator (2026.7) ignores the `ifGenerationMatch` / `ifGenerationNotMatch` preconditions on
downloads, uploads and deletes, and answers downloads without the `x-goog-generation` header. Real GCS
honours both and sends the header, and two clients here rely on that: tensorstore's gcs driver (which
writes orbax's arrays) re-reads its OCDBT manifest with `ifGenerationNotMatch=<the generation it holds>`
and fails with "Malformed StorageGeneration" on a 200 without a generation; the workdir lock
(bert_jax/run_lock.py) is a lease held by writes conditional on the lock object's generation. The
handlers below add what GCS does (412 on a failed precondition; 304 on a download whose
`ifGenerationNotMatch` holds); nothing else changes.
"""
import logging
import sys
from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


def _object_name(request) -> str | None:
  """The object a request is about: in the path (GET, DELETE), the query, or an upload's metadata."""
  if request.params.get("object_id"):
    return request.params["object_id"]
  if "name" in request.query:
    return request.query["name"][0]
  data = request.data
  return (data.get("meta") or data).get("name") if isinstance(data, dict) else None


def _generation(storage, bucket: str, name: str) -> str:
  """The object's live generation; "0" when there is none, as GCS's preconditions count it."""
  try:
    return str(storage.get_file_obj(bucket, name)["generation"])
  except NotFound:
    return "0"


def _conditional(handler, download: bool = False):
  """`handler` behind GCS's generation preconditions: 412 when one fails (a download whose
  ifGenerationNotMatch fails: 304); downloads also carry the object's generation in their headers."""

  def wrapped(request, response, storage, *args, **kwargs):
    name = _object_name(request)
    generation = "0" if name is None else _generation(storage, request.params["bucket_name"], name)
    if download and generation == "0":
      return handler(request, response, storage, *args, **kwargs)  # the emulator's 404
    match, not_match = (request.query.get(k, [None])[0] for k in ("ifGenerationMatch", "ifGenerationNotMatch"))
    if match is not None and match != generation:
      response.status = HTTPStatus.PRECONDITION_FAILED
      return None
    if not_match is not None and not_match == generation:
      response.status = HTTPStatus.NOT_MODIFIED if download else HTTPStatus.PRECONDITION_FAILED
      return None
    if download:
      response["x-goog-generation"] = generation
      response["x-goog-metageneration"] = str(storage.get_file_obj(request.params["bucket_name"], name)["metageneration"])
    return handler(request, response, storage, *args, **kwargs)

  return wrapped


_ORIGINAL = {"download": objects.download, "insert": objects.insert, "delete": objects.delete}
_PATCHED = {"download": _conditional(objects.download, download=True), "insert": _conditional(objects.insert),
            "delete": _conditional(objects.delete)}


def main(bucket: str) -> None:
  logging.disable(logging.WARNING)  # one request log line per call otherwise
  for name, handler in _PATCHED.items():
    setattr(objects, name, handler)  # objects.get calls download for ?alt=media; the server falls back to insert
  for _, handlers in server.HANDLERS:
    for method, handler in list(handlers.items()):
      for name, original in _ORIGINAL.items():
        if handler is original:
          handlers[method] = _PATCHED[name]
  emulator = server.create_server("127.0.0.1", 0, in_memory=True, default_bucket=bucket)
  emulator.start()
  print(emulator._api._httpd.server_address[1], flush=True)  # pylint: disable=protected-access
  # The server's (non-daemon) thread serves on until the test terminates this process.


if __name__ == "__main__":
  main(sys.argv[1])
