"""Ray Serve applications (the policy server). The engines they wrap live in dart_ray.engines."""
