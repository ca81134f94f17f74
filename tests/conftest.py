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


@pytest.fixture(autouse=True, scope="session")
def _measurements_forked():
    """``measure()`` and ``verify=True`` measure in fresh processes; here
    they are forked from one that has imported TensorFlow (``forked.py``),
    as the tests' own fresh processes are."""
    import importlib

    from . import forked

    measure = importlib.import_module("keras_memscope.measure")

    real = measure._run_process
    measure._run_process = forked.run
    yield
    measure._run_process = real
    forked.close_all()
