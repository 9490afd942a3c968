"""The e2e lane's steps, one module per part of the user path."""
