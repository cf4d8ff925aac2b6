"""Per-framework adapters, one package per framework, named after its import name.

Nothing here imports a framework: ``hurray_bridge.adapters.torch`` imports
torch only when it is itself imported.
"""
