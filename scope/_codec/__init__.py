"""The machinery behind ``scope.codec`` (private; the facade is the API).

- ``_errors``: the error each class raises, and the path-naming failure that unwinds
  through the generated code (``messages[1].parts[0].kind: ...``);
- ``_generated``: the namespace the generated functions live in, their source kept in
  ``linecache`` so tracebacks show it;
- ``_structure``: decoding, from a parsed tree into values (one generated function per
  class);
- ``_unstructure``: encoding, from values into what ``orjson.dumps`` writes (one
  generated function per class, plus the canonical-bytes caches).
"""
