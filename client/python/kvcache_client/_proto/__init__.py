"""Generated kvcache.v1 messages and gRPC stubs (client/python/generate_stubs.py); do not edit."""
