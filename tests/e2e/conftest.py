import pytest


@pytest.fixture(scope="session")
def grpc_url(triton_server) -> str:
    return f"127.0.0.1:{triton_server.grpc}"


@pytest.fixture(scope="session")
def http_url(triton_server) -> str:
    return f"127.0.0.1:{triton_server.http}"
