"""Test support: stateful fakes, function clients and pytest fixture plugins."""
