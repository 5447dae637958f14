"""`spillway console`: one page for the GPU hosts, the renders, the line, approvals and cloud
spend, and a JSON API beside it (docs/console.md). It reads and acts through spillway.client only;
its people and their hashed tokens live in SPILLWAY_SECRETS_DIR; its assets ship in the package,
so the page loads nothing from the network."""
