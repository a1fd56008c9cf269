"""Conversation history: batches, receipts, store protocols, middleware and windows."""

from scope.errors import AppendConflictError as AppendConflictError
from scope.errors import CommitError as CommitError
from scope.errors import ConversationClosedError as ConversationClosedError
from scope.errors import HistoryChangedError as HistoryChangedError
from scope.errors import HistoryError as HistoryError
from scope.errors import RestoreConflictError as RestoreConflictError
from scope.errors import StoreError as StoreError
from scope.errors import TurnInProgressError as TurnInProgressError
from scope.errors import TurnInterruptedError as TurnInterruptedError
from scope.errors import UnknownHeadError as UnknownHeadError
from scope.errors import WindowTooSmallError as WindowTooSmallError
from scope.history._adapter import StoreAdapter as StoreAdapter
from scope.history._batch import Batch as Batch
from scope.history._batch import Receipt as Receipt
from scope.history._branches import Branch as Branch
from scope.history._branches import branches as branches
from scope.history._branches import fork as fork
from scope.history._branches import rewind as rewind
from scope.history._branches import switch as switch
from scope.history._cache import HistoryCache as HistoryCache
from scope.history._compact import compact as compact
from scope.history._erasure import ErasureReceipt as ErasureReceipt
from scope.history._ids import AppendID as AppendID
from scope.history._ids import ConversationID as ConversationID
from scope.history._layers import Fence as Fence
from scope.history._layers import Interrupt as Interrupt
from scope.history._layers import KeepInterrupted as KeepInterrupted
from scope.history._layers import Layers as Layers
from scope.history._layers import Reject as Reject
from scope.history._layers import Unfenced as Unfenced
from scope.history._layers import Wait as Wait
from scope.history._layers import keyword_layers as keyword_layers
from scope.history._meta import ConversationMeta as ConversationMeta
from scope.history._middleware import Middleware as Middleware
from scope.history._movehead import MoveHead as MoveHead
from scope.history._protocols import Clearer as Clearer
from scope.history._protocols import Lister as Lister
from scope.history._protocols import Reader as Reader
from scope.history._protocols import ReadWriter as ReadWriter
from scope.history._protocols import Store as Store
from scope.history._protocols import TurnLeaser as TurnLeaser
from scope.history._protocols import ViewReader as ViewReader
from scope.history._protocols import Writer as Writer
from scope.history._restore import ClosedConversation as ClosedConversation
from scope.history._restore import Restorer as Restorer
from scope.history._retention import erase as erase
from scope.history._retention import erase_owner as erase_owner
from scope.history._retention import retain as retain
from scope.history._tokens import DefaultTokenCounter as DefaultTokenCounter
from scope.history._tokens import TokenCounter as TokenCounter
from scope.history._tree import HistoryTree as HistoryTree
from scope.history._turn import IncompleteReason as IncompleteReason
from scope.history._turn import IncompleteTurn as IncompleteTurn
from scope.history._turns import COMPACTION_KEY as COMPACTION_KEY
from scope.history._view import HistoryView as HistoryView
from scope.history._window import WindowReader as WindowReader

__all__ = [
    "AppendConflictError",
    "AppendID",
    "Batch",
    "Branch",
    "COMPACTION_KEY",
    "Clearer",
    "ClosedConversation",
    "CommitError",
    "ConversationClosedError",
    "ConversationID",
    "ConversationMeta",
    "DefaultTokenCounter",
    "ErasureReceipt",
    "Fence",
    "HistoryCache",
    "HistoryChangedError",
    "HistoryError",
    "HistoryTree",
    "HistoryView",
    "IncompleteReason",
    "IncompleteTurn",
    "Interrupt",
    "KeepInterrupted",
    "Layers",
    "Lister",
    "Middleware",
    "MoveHead",
    "ReadWriter",
    "Reader",
    "Receipt",
    "Reject",
    "RestoreConflictError",
    "Restorer",
    "Store",
    "StoreAdapter",
    "StoreError",
    "TokenCounter",
    "TurnInProgressError",
    "TurnInterruptedError",
    "TurnLeaser",
    "Unfenced",
    "UnknownHeadError",
    "ViewReader",
    "Wait",
    "WindowReader",
    "WindowTooSmallError",
    "Writer",
    "branches",
    "compact",
    "erase",
    "erase_owner",
    "fork",
    "keyword_layers",
    "retain",
    "rewind",
    "switch",
]

from scope._validate import publish as _publish

_publish(__name__, [n for n in __all__ if not n.endswith("Error")], globals())
