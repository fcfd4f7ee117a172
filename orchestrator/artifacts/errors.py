"""The artifacts' one error tree: each error has a stable `code` and the HTTP status the API
answers it with (orchestrator/api/errors.py maps them to problems)."""

from __future__ import annotations

from typing import Any


class ArtifactError(Exception):
    """An artifact request that cannot be done as asked; `detail` says what to do instead."""

    status = 400
    code = "bad_request"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class InvalidArtifact(ArtifactError):
    """A name, sha256 or size that no artifact can have."""

    status = 422
    code = "validation_error"


class NotYourBatch(ArtifactError):
    """The batch is unknown, or was sent to another device."""

    status = 403
    code = "batch_not_yours"


class BatchClosed(ArtifactError):
    """The batch's attempt has ended: nothing more may be published for it."""

    status = 409
    code = "batch_closed"


class TooLarge(ArtifactError):
    """Over `ORRERY_MAX_ARTIFACT_BYTES`, or past the size the upload declared."""

    status = 413
    code = "artifact_too_large"


class OffsetMismatch(ArtifactError):
    """A piece sent for another offset than the one staged; `offset` says where to go on."""

    status = 409
    code = "offset_mismatch"

    @classmethod
    def at(cls, staged: int, sent: int) -> OffsetMismatch:
        return cls(
            f"this upload holds {staged} bytes, so its next piece goes at offset {staged}, not {sent}", offset=staged
        )


class UploadIncomplete(ArtifactError):
    """Asked to finish an upload that does not yet hold all of its declared bytes."""

    status = 409
    code = "upload_incomplete"


class IntegrityFailed(ArtifactError):
    """The staged bytes do not have the declared sha256: nothing was recorded."""

    status = 422
    code = "integrity_error"


class UploadFailed(ArtifactError):
    """The upload ended without an artifact (bad content, or its batch ended): start another."""

    status = 409
    code = "upload_failed"


class ArtifactNotFound(ArtifactError):
    status = 404
    code = "not_found"


class RangeNotSatisfiable(ArtifactError):
    status = 416
    code = "range_not_satisfiable"


class LinkExpired(ArtifactError):
    """A download link past its time, or made by an API key revoked since."""

    status = 410
    code = "link_expired"


class QuotaExceeded(ArtifactError):
    """The task or the device would go over its artifact quota (bytes or uploads): nothing was
    accepted. `scope`, `limit`, `used` and `setting` say which quota."""

    status = 413
    code = "quota_exceeded"
