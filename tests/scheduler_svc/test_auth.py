"""API keys: loading, refusing weak keys, identifying the caller without leaking the key."""

from __future__ import annotations

import pytest

from scheduler_svc.api.auth import ApiKeys

A, B = "a" * 16, "b-0123456789abcdef"


def test_keys_load_from_a_file_without_comments_and_blank_lines(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# team a\n{A}\n\n  {B}  \n")
    keys = ApiKeys.load(path)
    assert len(keys) == 2
    assert keys.owner([("authorization", f"Bearer {A}")]) is not None
    assert keys.owner([("authorization", f"bearer   {B}")]) is not None


def test_each_key_has_its_own_owner_id_and_it_is_not_the_key():
    keys = ApiKeys([A, B])
    a = keys.owner([("authorization", f"Bearer {A}")])
    b = keys.owner([("authorization", f"Bearer {B}".encode())])
    assert a and b and a != b and A not in a and B not in b
    assert keys.owner([("authorization", f"Bearer {A}")]) == a  # stable


@pytest.mark.parametrize("metadata", [None, [], [("authorization", "Bearer ")],
                                      [("authorization", A)], [("x-api-key", A)],
                                      [("authorization", f"Bearer {A}x")],
                                      [("authorization", f"Bearer {A[:-1]}")]])
def test_no_or_a_wrong_key_is_no_one(metadata):
    assert ApiKeys([A, B]).owner(metadata) is None


def test_weak_keys_and_empty_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 16"):
        ApiKeys(["short"])
    (tmp_path / "k").write_text("# nothing\n")
    with pytest.raises(ValueError, match="no key"):
        ApiKeys.load(tmp_path / "k")
