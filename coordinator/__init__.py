"""artemis.coordinator"""
