"""OwnerProof: which members of the ownership group are instances of the service.

Any client that can join the consumer group is a member, and a member's ``client.id`` is
whatever it says: a plain consumer joining with ``client.id=http://attacker:18999`` is assigned
partitions like any instance. Before an instance sends a client (a 307) or a client's request (a
forward, with its ``Authorization``) to a member's URL, that member must prove it belongs:

* ``scaleout.secret``: each instance advertises ``<url> proof=v1:<hex>`` as its ``client.id``,
  the hex being HMAC-SHA256 over (group, url) with the secret. A member whose proof is missing or
  does not verify is not trusted.
* ``scaleout.trusted_urls``: the member's URL must be one of them. With both, both must hold.

Why the proof binds the URL and not the member id: ``client.id`` is fixed when the consumer is
created, before the coordinator assigns the member id, and the group's members are visible to
anyone who may describe the group. So a proof can be copied — but only together with the URL it
signs, which is a genuine instance's: whatever is sent there reaches an instance holding the
secret, never the copier. (That instance sees a member other than itself claiming its URL and
serves the partitions itself: :meth:`PartitionOwnership.owner`.)

Pure computation: no I/O, no lock; verify() is called once per member per describe.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from pydantic import SecretStr

__all__ = ["OwnerProof", "Verdict"]

PROOF_MARK = " proof=v1:"  # a space never occurs in an advertised URL (settings refuse it)
_DOMAIN = b"kafka-purgatory scale-out owner v1\0"  # this HMAC signs nothing else


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a member's ``client.id`` says: its URL, whether it is trusted, and why not."""

    url: str
    trusted: bool
    reason: str | None = None  # why it is not trusted (never contains the secret)


class OwnerProof:
    """Signs this instance's ``client.id`` and verifies the other members' (module docstring)."""

    def __init__(self, group_id: str, secret: SecretStr | None, trusted_urls: tuple[str, ...] = ()) -> None:
        self.group_id = group_id
        self._key = secret.get_secret_value().encode() if secret is not None else None
        self._trusted_urls = frozenset(trusted_urls)

    @property
    def configured(self) -> bool:
        """False when neither a secret nor an allow-list is set: no other member is trusted."""
        return self._key is not None or bool(self._trusted_urls)

    def _mac(self, url: str) -> str:
        assert self._key is not None
        message = _DOMAIN + self.group_id.encode() + b"\0" + url.encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def client_id(self, url: str) -> str:
        """What this instance advertises: its URL, and its proof when a secret is set."""
        return url if self._key is None else f"{url}{PROOF_MARK}{self._mac(url)}"

    def verify(self, client_id: str) -> Verdict:
        """The URL a member advertises and whether requests may be sent there."""
        url, mark, proof = client_id.partition(PROOF_MARK)
        if not self.configured:
            return Verdict(url, False, "neither scaleout.secret nor scaleout.trusted_urls is set")
        if self._trusted_urls and url not in self._trusted_urls:
            return Verdict(url, False, "url not in scaleout.trusted_urls")
        if self._key is not None:
            if not mark:
                return Verdict(url, False, "no proof in client.id")
            # compare_digest: the time taken does not tell how much of a forged proof was right.
            if not hmac.compare_digest(proof.encode(), self._mac(url).encode()):
                return Verdict(url, False, "proof does not verify (another secret, or forged)")
        return Verdict(url, True)
