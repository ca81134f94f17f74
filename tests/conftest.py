import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_keras_names():
    """Layer names restart for every test so that expected names are stable."""
    import keras

    keras.utils.clear_session()
    yield
