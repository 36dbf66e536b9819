"""The wire model: topics and payloads of SPEC §1, validated into engine values."""
