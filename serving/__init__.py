"""Using a trained model: search the catalog's images and sentences with it."""
