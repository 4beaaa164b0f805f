"""The MindSpore front end, a plugin of the recorder contract (``detcheck._core.contract``):
the front end (``frontend``), the operator trace (``ops``) and the zero-change recorder
(``auto``). Imports ``_core`` and the native module, never another framework's folder
(tests/tidy.rs).
"""
