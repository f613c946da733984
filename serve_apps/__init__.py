"""Ray Serve applications: the policy server (`policy`: generation and the OpenAI route;
`weights`: how a replica follows the published weights; `weight_registry`: the newest
weights for replicas that start later). The engines they wrap live in dart_ray.engines."""
