"""Ray actors that wire the dart_ray library to a Ray cluster (env sessions, rollouter,
curator, weight hub). Thin by design: the logic lives in dart_ray; see ARCHITECTURE.md."""
