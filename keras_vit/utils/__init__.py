"""Shared plumbing every room uses and that uses no room: the one warning channel
(console), files on any filesystem written atomically (storage), workdir locks (locks),
label lists (labels), flag types (flags), lazy package exports (lazy), the install and
backend checks (install_check, backend_guard)."""
