"""Rollout: one episode (observation -> prompt -> policy -> parse -> env step), and the
scheduler that decides which task, group and step budget each new episode gets."""
