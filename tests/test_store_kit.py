"""The backend kit every persistent store shares (``scope.historystores._common``): what
a server-side append's outcome means, in one place."""

from __future__ import annotations

import pytest

from scope.chat import assistant_message, user_message
from scope.errors import (
    AppendConflictError,
    ConversationClosedError,
    HistoryChangedError,
    StoreError,
)
from scope.history import Batch
from scope.historystores._common import check_outcome

BATCH = Batch("c", "a1", [user_message("q"), assistant_message("a")], expected_length=4)


def test_inserted_and_a_retry_of_the_same_digest_are_fine() -> None:
    check_outcome(BATCH, "inserted", "the script")
    check_outcome(BATCH, f"accepted:{BATCH.digest}", "the script")


def test_each_refusal_is_its_own_error() -> None:
    with pytest.raises(ConversationClosedError, match="conversation 'c' is closed"):
        check_outcome(BATCH, "closed", "the script")
    with pytest.raises(AppendConflictError, match="was accepted with digest sha256:00"):
        check_outcome(BATCH, "accepted:sha256:00", "the script")
    with pytest.raises(HistoryChangedError) as caught:
        check_outcome(BATCH, "changed:6", "the script")
    assert (caught.value.expected, caught.value.actual) == (4, 6)


@pytest.mark.parametrize("outcome", ["", "inserted!", "changed:", "changed:x", "deleted"])
def test_anything_else_names_its_source(outcome: str) -> None:
    with pytest.raises(StoreError, match="the script returned"):
        check_outcome(BATCH, outcome, "the script")


def test_a_fence_outcome_for_an_unfenced_batch_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="returned 'changed:2'"):
        check_outcome(BATCH.fenced(None), "changed:2", "the script")
