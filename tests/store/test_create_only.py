"""``fs.pipe_file(path, data, mode="create")``: the conditional create the commit protocol relies on.

What each store does when the object already exists (fsspec 2026.9, s3fs 2026.9, gcsfs 2026.10,
adlfs 2026.8 against the emulators the tests start); every one raises the builtin ``FileExistsError``:

- s3: PutObject with ``If-None-Match: *`` (above 100 MiB a multipart upload whose completion
  carries it) -> 412 PreconditionFailed -> ``FileExistsError``, ``__cause__`` the botocore
  ``ClientError``. s3fs does so only when the error names ``Condition: If-None-Match`` (moto's
  does); otherwise a 412 becomes ``OSError(EINVAL)``. A 409 ConditionalRequestConflict, which AWS
  answers to concurrent conditional writes, becomes a plain ``OSError(EIO)``; moto never sends it.
- gcs: upload with ``ifGenerationMatch=0`` -> 412 -> ``FileExistsError(<upload URL>)`` (gcsfs maps
  every 412 so; the message names the upload URL, not the object).
- azure: Put Blob with ``If-None-Match: *`` (``upload_blob(overwrite=False)``) -> 409
  BlobAlreadyExists -> azure ``ResourceExistsError`` -> adlfs raises ``FileExistsError(<blob path
  without its container>)`` while handling it (``__context__``, not ``__cause__``).
- memory: ``open(path, "xb")``, which checks ``exists()`` and then writes -> ``FileExistsError``.
- local: fsspec's ``AbstractFileSystem.pipe_file`` checks ``exists()`` and then opens with "wb" ->
  ``FileExistsError``, but NOT atomically: a writer between the check and the open is overwritten.

The cloud stores decide on the server, in one request, so two writers racing for one name get
one success and one ``FileExistsError``; local and memory only check first.
"""

from __future__ import annotations

import uuid

import fsspec
import pytest


@pytest.fixture(params=["memory", "local", pytest.param("s3", marks=pytest.mark.s3),
                        pytest.param("gcs", marks=pytest.mark.gcs), pytest.param("azure", marks=pytest.mark.azure)])
def store(request: pytest.FixtureRequest, tmp_path) -> tuple[str, fsspec.AbstractFileSystem, str]:  # type: ignore[no-untyped-def]
    """(name, filesystem, a directory path on it that exists)."""
    if request.param == "memory":
        url, opts = f"memory://kbs-{uuid.uuid4().hex}", {}
    elif request.param == "local":
        url, opts = str(tmp_path), {}
    else:
        url = request.getfixturevalue(f"{request.param}_root")
        opts = request.getfixturevalue(f"{request.param}_storage_options")
    fs, path = fsspec.core.url_to_fs(url, **opts)
    fs.makedirs(path, exist_ok=True)
    return request.param, fs, path


def test_create_refuses_existing_object(store: tuple[str, fsspec.AbstractFileSystem, str]) -> None:
    name, fs, root = store
    path = f"{root}/manifest.json"
    fs.pipe_file(path, b"first", mode="create")  # absent: created
    with pytest.raises(FileExistsError) as e:
        fs.pipe_file(path, b"second", mode="create")
    assert fs.cat_file(path) == b"first"
    if name == "s3":
        from botocore.exceptions import ClientError

        assert isinstance(e.value.__cause__, ClientError)
        assert e.value.__cause__.response["Error"]["Code"] == "PreconditionFailed"
        assert e.value.__cause__.response["Error"]["Condition"] == "If-None-Match"
    elif name == "azure":
        from azure.core.exceptions import ResourceExistsError

        assert isinstance(e.value.__context__, ResourceExistsError)
        assert e.value.__context__.error_code == "BlobAlreadyExists"
        assert str(e.value) == path.split("/", 1)[1]  # adlfs names the blob without its container
    elif name == "gcs":
        assert "/upload/storage/v1/b/" in str(e.value)  # gcsfs names the upload URL, not the object
    # overwrite (the default) still replaces
    fs.pipe_file(path, b"third")
    assert fs.cat_file(path) == b"third"


def test_create_many_names_each_once(store: tuple[str, fsspec.AbstractFileSystem, str]) -> None:
    _, fs, root = store
    for i in range(3):
        fs.pipe_file(f"{root}/seg-{i}", bytes([i]) * 10, mode="create")
    for i in range(3):
        with pytest.raises(FileExistsError):
            fs.pipe_file(f"{root}/seg-{i}", b"x", mode="create")
        assert fs.cat_file(f"{root}/seg-{i}") == bytes([i]) * 10


def test_local_create_is_check_then_write(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Record, not endorse: fsspec's local create checks ``exists()`` and then opens with "wb".

    A writer landing between the check and the open is overwritten (simulated by hiding the file
    from ``exists``). Should this start failing, fsspec made local creates atomic (``O_EXCL``).
    """
    fs = fsspec.filesystem("file", skip_instance_cache=True)
    path = str(tmp_path / "manifest.json")
    fs.pipe_file(path, b"first", mode="create")
    monkeypatch.setattr(fs, "exists", lambda *a, **k: False)
    fs.pipe_file(path, b"second", mode="create")
    assert fs.cat_file(path) == b"second"
