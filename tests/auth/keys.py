"""Key material for auth tests, made once per session (RSA generation is slow)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


@dataclass(frozen=True)
class KeyPair:
    private: PrivateKey
    public_pem: bytes

    @property
    def private_pem(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


def _pair(private: PrivateKey) -> KeyPair:
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(private, pem)


@functools.cache
def rsa_pair(bits: int = 2048) -> KeyPair:
    return _pair(rsa.generate_private_key(public_exponent=65537, key_size=bits))


@functools.cache
def ec_pair(curve: str = "secp256r1") -> KeyPair:
    curves: dict[str, ec.EllipticCurve] = {"secp256r1": ec.SECP256R1(), "secp384r1": ec.SECP384R1()}
    return _pair(ec.generate_private_key(curves[curve]))


@functools.cache
def ed25519_pair() -> KeyPair:
    return _pair(ed25519.Ed25519PrivateKey.generate())


HS_SECRET = b"s" * 16 + b"0123456789abcdef-extra"
OTHER_HS_SECRET = b"t" * 40
