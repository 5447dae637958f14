"""The ground floor: what the workflows, the activities and everything above them share.

Pure rules (the routing decision, the GPU pool's and the spend ledger's books, the seal on a
ledger's input, signed approvals, checks of input images), the models that cross a boundary,
every name on the wire and the settings. Workflows import these inside
`workflow.unsafe.imports_passed_through()`, so nothing here touches Temporal's client or a
service. The only I/O is where a module's job is to read something: `settings` reads the
environment and the secrets folder (and writes a generated secret there once), `tiers` reads
`routing_tiers.json`, and `addresses` resolves a client's host name to check where a URL leads.

The core imports nothing of spillway's outside itself: the import-linter contract in
pyproject.toml keeps it the lowest layer, below `activities`, `workflows`, `spillway.temporal`,
`spillway.schema`, the client, the simulators and the CLI (docs/layout.md).
"""
