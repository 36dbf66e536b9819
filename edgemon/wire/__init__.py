"""The wire model: topics and payloads of docs/protocol.md, validated into engine values."""
